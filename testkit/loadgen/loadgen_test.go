package loadgen

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		rate    float64
		workers int
		call    func()
		min     int64 // calls at least
		max     int64 // calls at most (0: no bound)
	}{
		// 200 ms at 500/s owes 100 calls, whatever the calls cost: a call
		// slower than the interval does not slow the open loop down.
		{name: "open loop sends what the rate owes", rate: 500, call: func() { time.Sleep(50 * time.Millisecond) }, min: 100, max: 100},
		{name: "closed loop calls back to back", workers: 4, call: func() { time.Sleep(10 * time.Millisecond) }, min: 4, max: 4 * 21},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int64
			start := time.Now()
			sending := Run(start, start.Add(200*time.Millisecond), tc.rate, tc.workers, func() { n.Add(1); tc.call() })
			if got := n.Load(); got < tc.min || tc.max > 0 && got > tc.max {
				t.Errorf("%d calls, want %d to %d", got, tc.min, tc.max)
			}
			if sending < 200*time.Millisecond {
				t.Errorf("sent for %v, want at least the 200ms asked", sending)
			}
		})
	}
}
