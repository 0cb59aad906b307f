// Package testwait polls a condition with a deadline, so multi-process tests
// await what they need instead of sleeping a fixed time.
package testwait

import (
	"testing"
	"time"
)

// interval is short against every bound the tests use and long enough not to
// load a busy 2-core machine with checks.
const interval = 20 * time.Millisecond

// For calls cond until it reports true, at least once and until d has passed,
// then fails t naming what it waited for and cond's last explanation.
func For(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %s", d, what, why)
		}
		time.Sleep(interval)
	}
}
