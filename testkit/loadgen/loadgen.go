// Package loadgen drives a call for a while, closed- or open-loop, the way
// the overload test's generator and bench/adminbench's overload part do.
package loadgen

import (
	"sync"
	"time"
)

// Run calls call until deadline. With rate 0 it is closed-loop: workers
// goroutines call back to back. Otherwise it is open-loop at rate calls a
// second whatever the answers: each millisecond it starts, each on its own
// goroutine, as many calls as the rate owes since start, so a late tick
// catches up rather than sending less. It returns how long it sent (from
// start until the last call was started, or the closed loop's last call
// ended) after every call has returned.
func Run(start, deadline time.Time, rate float64, workers int, call func()) time.Duration {
	var wg sync.WaitGroup
	if rate == 0 {
		for range workers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					call()
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var started int64
	for now := range tick.C {
		if now.After(deadline) {
			now = deadline
		}
		for owed := int64(now.Sub(start).Seconds() * rate); started < owed; started++ {
			wg.Go(call)
		}
		if now.Equal(deadline) {
			break
		}
	}
	sending := time.Since(start)
	wg.Wait()
	return sending
}
