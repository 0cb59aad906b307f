package boottime

import (
	"runtime"
	"testing"
)

func TestReadIsMonotonicUnderOneBootID(t *testing.T) {
	t.Parallel()
	a, ok := Read()
	if runtime.GOOS != "linux" {
		if ok {
			t.Fatalf("read %+v without CLOCK_BOOTTIME", a)
		}
		return
	}
	if !ok || a.BootID == "" || a.Since <= 0 {
		t.Fatalf("Read() = %+v, %v", a, ok)
	}
	b, ok := Read()
	if !ok || b.BootID != a.BootID || b.Since < a.Since {
		t.Fatalf("second Read() = %+v, %v after %+v", b, ok, a)
	}
}
