package testwait

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestForReturnsOnceTrue(t *testing.T) {
	t.Parallel()
	calls := 0
	For(t, 5*time.Second, "third call", func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprint(calls)
	})
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

// recorder captures Fatalf so the timeout path can be asserted.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(r)
}

func TestForFailsNamingWhatAndWhy(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != r {
				t.Fatalf("For did not fail through Fatalf: %v", p)
			}
		}()
		For(r, 0, "the impossible", func() (bool, string) { return false, "still no" })
	}()
	if !strings.Contains(r.msg, "the impossible") || !strings.Contains(r.msg, "still no") {
		t.Fatalf("failure %q does not name what and why", r.msg)
	}
}
