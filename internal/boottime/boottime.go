// Package boottime reads the host's CLOCK_BOOTTIME and boot id: the one
// clock that a pod's sidecar and runner, two processes on one kernel, both
// read. It counts through suspend and never steps, so an instant on it
// means the same to both even when either was paused, unlike a duration
// counted from when a message arrived (docs/architecture.md#fencing).
package boottime

import (
	"os"
	"strings"
	"sync"
	"time"
)

// Stamp is an instant on one host's boot clock.
type Stamp struct {
	// BootID names the kernel's boot (/proc/sys/kernel/random/boot_id):
	// instants are comparable only under the same one.
	BootID string
	// Since is CLOCK_BOOTTIME: the time since that boot.
	Since time.Duration
}

// Reader reads the boot clock now; false where there is none (another
// system, /proc unreadable), and then nothing is bounded by it. Tests
// inject their own.
type Reader func() (Stamp, bool)

// Read is the host's Reader.
func Read() (Stamp, bool) {
	id, ok := bootID()
	if !ok {
		return Stamp{}, false
	}
	since, ok := clockBoottime()
	if !ok {
		return Stamp{}, false
	}
	return Stamp{BootID: id, Since: since}, true
}

// bootID is read once: it changes only with a reboot, which ends the
// process.
var bootID = sync.OnceValues(func() (string, bool) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	id := strings.TrimSpace(string(b))
	return id, err == nil && id != ""
})
