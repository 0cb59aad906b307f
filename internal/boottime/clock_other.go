//go:build !linux

package boottime

import "time"

// clockBoottime: no CLOCK_BOOTTIME here, so nothing is bounded by it.
func clockBoottime() (time.Duration, bool) { return 0, false }
