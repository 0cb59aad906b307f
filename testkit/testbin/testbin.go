// Package testbin builds the project's binaries once per checkout so that
// multi-process tests run the real commands without depending on `make build`.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Path returns the path of the named command under cmd/ (e.g. "prism"),
// built with the race detector off, on first use in this process.
//
// The binaries live in the user's cache directory, one place per checkout
// (~/.cache/prism-testbin/<hash of the module root>/), not in a temporary
// directory per test process: `go test ./...` runs a process per package, and
// ~100 MB each filled /tmp. They are also built once per checkout, not once
// per process: `go build -o` leaves an output whose build ID says it is up to
// date untouched, so the build goes to a fixed staging path (build/<name>),
// under a file lock that makes the packages' processes wait for one link
// instead of each linking its own copy at the same time. The staged file is
// published under <name> by a hard link renamed into place, so a test of
// another package that runs the binary at that moment sees the old file or the
// new one, never half of one (go build rewrites the staged file in place).
func Path(name string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := cacheDir(root)
	if err != nil {
		return "", err
	}
	unlock, err := lock(filepath.Join(dir, name+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	stage := filepath.Join(dir, "build", name)
	cmd := exec.Command("go", "build", "-o", stage, "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, b)
	}
	out := filepath.Join(dir, name)
	if err := publish(stage, out); err != nil {
		return "", fmt.Errorf("testbin: publish %s: %w", name, err)
	}
	// pruneStale judges a checkout by its directory's time: this one is in use.
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	built[name] = out
	return out, nil
}

// publish makes out the same file as stage, unless it already is.
func publish(stage, out string) error {
	si, err := os.Stat(stage)
	if err != nil {
		return err
	}
	if oi, err := os.Stat(out); err == nil && os.SameFile(si, oi) {
		return nil
	}
	tmp := out + ".new"
	_ = os.Remove(tmp)
	if err := os.Link(stage, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// lock takes an exclusive lock on path, shared by every process of the
// checkout, and returns its release.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbin: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("testbin: lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// staleAfter is how long a checkout's binaries stay once nothing has built
// there: checkouts come and go (worktrees, clones in temporary directories),
// and each leaves ~150 MB behind.
const staleAfter = 7 * 24 * time.Hour

func cacheDir(root string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	base = filepath.Join(base, "prism-testbin")
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(base, hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(filepath.Join(dir, "build"), 0o755); err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	pruneStale(base, dir, time.Now())
	return dir, nil
}

// pruneStale removes the other checkouts' directories under base that no
// test has used (each Path call sets the directory's modification time) for
// staleAfter.
func pruneStale(base, keep string, now time.Time) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(base, e.Name())
		if path == keep || !e.IsDir() {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > staleAfter {
			_ = os.RemoveAll(path)
		}
	}
}

func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("testbin: cannot locate source")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}
